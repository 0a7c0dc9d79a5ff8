"""Monitoring of the machine a run is on: its health before and after (kernel log, PCIe, ECC), telemetry sampled
during the run, and the host CPU's features."""
