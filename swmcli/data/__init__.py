"""Data, from the ring to the disk and back: the ``ReplayBuffer`` (``buffer``; ``clips`` is the
index math it shares with every dataset), swm's own formats (``storage/``), other tools' layouts
read (``foreign/``) and written (``exports/``), the registry over all of them (``formats``),
verified copies (``copy``) and checks (``verify``), and the clips streamed to training
(``streaming``). This floor returns data and never prints.
"""
