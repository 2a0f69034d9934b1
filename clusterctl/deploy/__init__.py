"""Deploy: render vLLM instances as systemd units, plan, apply, roll out (issue #8).

The pipeline, as in staging: render what each host should have (pure:
``units/``), read what it has (``remote``), show the difference
(``rollout/plan``), then apply in batches behind health gates with a way back
(``rollout/``).  ``spec`` holds the names and paths every part agrees on,
``state`` the control-side deploy state.  Sub-packages by job: ``units/``
(rendering), ``placement/`` (replicas onto GPUs), ``preflight/`` (refuse
before starting), ``rollout/`` (the engine and its steps), ``status/``
(reading running instances), ``playbooks/`` (declarative bring-up).
"""
