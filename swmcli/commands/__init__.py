"""The commands, one module each, each read top to bottom: ``collect``, ``convert`` (and
``info``), ``train``, ``evaluate``, ``memprofile``. A command takes the resolved config and the
memory monitor and returns a ``report.CommandResult``; commands never import each other: what
they share sits a floor below (``memory``, ``training``, ``planning``, ``data``, ``models``,
``envs``)."""
