"""speczoo.decoding.eagle: the EAGLE-3 head (head.py), its speculators format (config.py, io.py), its
training data (features.py, vocab.py), training (ttt.py, train.py, pipeline.py) and where trained
heads live (registry.py). The drafter that uses a head is decoding/drafters/eagle.py."""
