"""Model staging, control side: ``plan`` (sources, manifests, chain plans), ``run``
(over a Fleet) and ``bundle`` (the node-side modules of ``clusterctl/node/stage/``
packed into one ``python3 -c`` program).  See docs/staging.md.
"""
