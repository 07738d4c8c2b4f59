"""Instruction forms: what can be measured on this host, and under which name.

``x86`` (forms from iced-x86: operands, encodings, AT&T text, encode/decode) and ``catalogue``
(every form of the host with its status and exclusion reason, name and AT&T resolution). The
catalogue's smoke run needs the harness, which sits above this floor: the caller passes it in
(:class:`cpumap.measure.smoke.SmokeRun`). May import ``store`` and ``host``.
"""
