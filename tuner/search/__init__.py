"""Search: the loop (`loop.Tuner`) and the XGBoost cost model (`costmodel.XGBCostModel`)."""
