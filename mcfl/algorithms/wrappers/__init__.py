"""What a run's plan wraps any algorithm with: a client schedule, a distribution shift, FedBN's
local layers, Poisson-sampled participants and clients as they are on the simulated clock."""
