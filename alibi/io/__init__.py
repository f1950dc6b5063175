"""Input and output at the edges: what every other folder reads and writes through.

- `atomic`: files and folders written under a staging name and renamed into place when complete;
- `jsonio`, `yamlio`: bounded readers of JSON and YAML that came from outside (one InputError each);
- `typed`: the one serializer: every result dataclass to JSON and back, types checked on the way in;
- `digests`: sha256 of bytes, files and listings of files;
- `limits`: bounds on sizes and values from the input, checked before anything is allocated;
- `progress`: a bar on a terminal, plain lines elsewhere, nothing under --quiet.

Imports nothing from alibi but `alibi.errors` (and its own modules).
"""
