"""MESA (seed 002, DESIGN §7): five memory structures per episode and the selection of a subset of them.

Structures (builder + fixed access; each access returns text, covered step indices and a preview):
:mod:`~routers.mesa.summary` (S), :mod:`~routers.mesa.temporal` (T), :mod:`~routers.mesa.graph` (G, triples from
:mod:`~routers.mesa.openie`), :mod:`~routers.mesa.vector` (V), :mod:`~routers.mesa.raw` (R); shared pieces in
:mod:`~routers.mesa.base`; building/caching/failure isolation in :mod:`~routers.mesa.library`; the appendix-C.3
prompt and token counting in :mod:`~routers.mesa.compose`; the sweep record format (canonical names, subset
keys, validator) in :mod:`~routers.mesa.sweep_format`. The sweep job is ``memroute synth mesa``
(:mod:`data_synthesis.mesa`). Selector policies and the UCB search live in the ``policies*``, ``selector*`` and
``search*`` modules.
"""
