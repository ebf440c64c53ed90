"""Datasets written in other tools' layouts (``swm convert --layout``): which writer for which
layout (``layouts``), stable-worldmodel's Lance and HDF5 (``upstream``), LeRobot v3
(``lerobot``)."""
