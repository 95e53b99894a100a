"""speczoo.decoding.eagle: the EAGLE-3 head (head.py), its speculators format (config.py, io.py), the
heads of a loaded target (loaded.py) and a head's replayed acceptance (replay.py). The drafter that
uses a head is decoding/drafters/eagle.py; installed heads are found through zoo/heads.py. Training a
head lives in training/eagle/ and is never imported from here."""
