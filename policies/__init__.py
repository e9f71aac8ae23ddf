"""Site policies: pairing, slicing and admission.

Every policy is pure (no subprocess, clock, DB or network) so that the controller and the
simulator run the very same objects. One protocol per extension point lives in
:mod:`policies.base`.
"""
