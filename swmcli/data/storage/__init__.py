"""swm's own on-disk formats: Lance (default), HDF5 and a folder of PNGs, all holding
``schema.py``'s rows and metadata, with checksums (``checksums``), writer and reader locks
(``lock``) and local or object-store places (``location``)."""
