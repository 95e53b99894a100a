"""speczoo.training.eagle: training an EAGLE-3 head on its target's own features — the target's chat
answers (answers.py), the feature cache (features.py), the draft vocabulary (vocab.py), the
training-time test (ttt.py), the training loop (train.py), held-out judgement and calibration
(holdout.py) and `train-eagle` end to end (pipeline.py). The head itself, its on-disk format and its
use in drafting are inference: decoding/eagle/."""
