"""speczoo.decoding.eagle: the EAGLE-3 head (head.py) and its speculators format (config.py, io.py).
The drafter that uses a head is decoding/drafters/eagle.py, a head's replayed acceptance
decoding/eagle_replay.py; a loaded target's head is resolved at load by eagle_drafters.py from
zoo/heads.py. Training a head lives in training/eagle/ and is never imported from here."""
