"""Evaluation without labels: each client's accuracy estimated from the logits of its unlabelled images
(`estimators`), calibration where labels exist (`calibration`), and the model each client keeps, chosen by an
estimate (`choice`). Pure functions: `estimators` and `calibration` of logits (torch), `choice` of the numbers a run
records (plain Python, for fedur-report and fedur-tables). docs/label-free.md says how far to trust each."""
