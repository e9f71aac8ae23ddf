"""The slurmrl controller daemon: RPC server, lease scheduler, pairing, pools, reconciler.

(This file makes the directory a regular package, so that `pip install` ships it: without
it the installed `slurmrl controller` was "No such command".)
"""
