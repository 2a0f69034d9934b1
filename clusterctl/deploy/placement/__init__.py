"""Placement: template replicas onto free GPU groups, the GPU topology it reads, cordons, replica overrides (scale) and the inventory as deployed."""
