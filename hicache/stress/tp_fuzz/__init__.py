"""hicache.stress.tp_fuzz: the TP fuzz harness (``python -m hicache.stress.tp_fuzz``).

``fuzz`` launches the ranks and reports a row per scenario; ``rank`` is one rank's loop;
``scenarios`` and ``faults`` the rank-local faults; ``ops`` the step table; ``diff`` names the
diverging nodes. Built on the stress harness (``hicache.stress``) and ``hicache.tp``.
"""
