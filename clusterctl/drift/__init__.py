"""Output drift against named baselines, noise-floor calibration and the context-leak check (``clusterctl drift``)."""
