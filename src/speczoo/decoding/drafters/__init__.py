"""speczoo.decoding.drafters: the drafters, one file each on base.py's interface (ngram.py, ngram_tree.py,
draft_model.py with draft_head.py and guess.py, eagle.py), and registry.py, one frozen descriptor per
drafter: the only place its name, factory, cost and the facts the engine, the batch and the commands
read are said."""
