"""Systems for scale: sharded Muon, dual-mesh HSDP, router replay, delta weight sync, MXFP8."""
