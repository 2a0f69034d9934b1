"""The gateway: nginx in front of the vLLM instances (issue #13, docs/gateway.md).

``render`` turns the inventory and the instances' states into nginx files
(pure); ``sync`` decides those states from deploy's status and reloads only
on change; ``deploy`` installs files on a gateway host (``nginx -t``, then a
reload that drops no connection); ``hook`` is the drain hook deploy calls.
"""
