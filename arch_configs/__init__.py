"""Data only: the candidate space of the template chip (candidate_space.yaml), the system space's
memories and links (system_space.yaml) and the calibration set of published measured training runs
(calibration/). Installed as `phaze_hardware.arch_configs`; read through `phaze_hardware.data`."""
