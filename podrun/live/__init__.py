"""Live views of a running launch: its state as one record (state), served as OpenMetrics (prom), written as
TensorBoard event files (tensorboard), shown by `podrun top` (top)."""
