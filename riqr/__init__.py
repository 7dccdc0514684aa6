"""The ``riqr`` command: ``demo``, ``up``, ``down``, ``run``, ``produce`` (see ``riqr.cli``)."""
