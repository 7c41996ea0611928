"""What every algorithm is built from: its functions (`base`), the registry, the round skeleton, the
algorithm on the device (`device`) and the per-client rows a client store keeps (`stored`)."""
