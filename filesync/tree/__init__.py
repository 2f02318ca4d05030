"""The code the host and the remote share: stdlib only, shipped whole to the remote.

Every module here imports only the standard library and this package, so that
``filesync.tree.bundle`` can send the package as one compressed bundle to a remote with
nothing but ``python3``, and the host imports the very same modules for its own walk,
watch and path checks. ``tests/tree/test_stdlib_only.py`` holds the package to that.

- ``ignore``: the exclusion evaluator (gitignore semantics, checked against git);
- ``paths``: the one path-safety rule and root resolution;
- ``walk``: the tree walk that prunes excluded directories before descending;
- ``watch``: inotify-kept listings (Linux);
- ``dirfd``: file operations through directory descriptors that never follow a symlink;
- ``wire``: frames, row layouts and reason codes;
- ``server``: the request loop the remote runs;
- ``bundle``: the compressed bundle and the loader that runs it on the remote.
"""
