"""The foundations every layer stands on, importing nothing else of the library.

* ``filenames``: every file name a run folder holds (one definition each);
* ``atomic``: atomic writes (temp file, fsync, rename; a full disk named, stale temporaries
  removed) and torn-line-tolerant jsonl logs;
* ``checked_files``: the one checked JSON / TOML reader (every problem names the file);
* ``device``: the device and precision pick, seeding, free memory (``check_fits``);
* ``download``: MiniMind's datasets and weights from the Hub, the one network access.
"""
