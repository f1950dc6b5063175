"""Statistics over replay and sweep records: flip analysis (margins, ROC, calibration) and depth fits."""
