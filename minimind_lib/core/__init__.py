"""The foundations every layer stands on, importing nothing else of the library.

* ``filenames``: every file name a run folder holds (one definition each);
* ``atomic``: atomic writes (temp file, fsync, rename) and torn-line-tolerant jsonl logs;
* ``device``: the device and precision pick, seeding;
* ``download``: MiniMind's datasets and weights from the Hub, the one network access.
"""
