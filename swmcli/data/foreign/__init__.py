"""Datasets written by other tools, read in swm's convention: stable-worldmodel's layouts
(``upstream``, ``upstream_files``), Minari (``minari``) and LeRobot v3 (``lerobot``), behind one
front (``reader``); frames decoded by ``jpeg`` and ``video``."""
