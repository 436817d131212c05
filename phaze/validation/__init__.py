"""`phaze validate`'s library: the recipes of published runs (`recipes`), their FLOP accounting
(`flops`), the calibration set's checked reading (`runs`) and a run as a case phaze predicts
(`cases`). The command is `phaze.validate`."""
