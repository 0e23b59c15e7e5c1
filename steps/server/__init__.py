"""The SGLang server that `deploy` starts and `stop_server` stops, and where it runs (its topology).

No step kind lives here: the kinds (steps/deploy.py, steps/stop_server.py) call down into these modules, which
never import a kind back. From the bottom up:

- `documents`: what the deploy host program prints (start, launch, stop) and the facts made of it;
- `base`: the launch command as words (`Launch`), what both kinds share (`ServerStep`: the port, the state
  folder, `nodes`), and `Deployment`, what a topology reads of a `deploy` step;
- `one_node` and `node_group`: the two topologies. Each owns what differs between a server on one host and
  one across several: how the launch is rendered per rank, what is planned and shown, how the start is
  waited for (one host program waits, or the readiness barrier watches every rank until rank 0 serves),
  which hosts are stopped, and the facts;
- `topology`: which of the two a step's `nodes` make.
"""
