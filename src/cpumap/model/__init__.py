"""Resource models of the CPU: their format, how Palmed infers them, and how they are checked.

``resmodel`` (the model file and its prediction, max over resources), ``palmed`` (the
inference, stage by stage, pure: it asks a callback for cycles), ``palmed.build`` (the stages
as resumable steps), ``jobs`` (one function per pipeline job, against a
:class:`cpumap.measure.backend.Measurer`), ``validation`` (held-out random kernels and their
metrics), ``simulate`` and ``portmap`` (simulated machines whose truth is a port mapping or a
resource model: the pipeline's and the tests' known answer, handed to the measuring backend).
May import ``store``, ``host``, ``isa`` and ``measure``.
"""
