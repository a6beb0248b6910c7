"""Runs a sweep's trials on Ray Tune; the driver-side callback is the single DB writer."""
