"""Client-level differential privacy.

* `mechanism`: DP-FedAvg's Gaussian mechanism (clipping, noise, adaptive clipping) as a message
  transform;
* `accounting`: the accountant on dp-accounting (RDP, PLD), epsilon after every round, noise
  solved for a target;
* `plan`: a run's privacy settled before it starts (`PrivacyPlan`);
* `support`: which algorithms it covers and how each round is accounted, or why not;
* `sampling`: Poisson sampling of a round's clients in fixed slots;
* `canaries` and `empirical`: the one-shot empirical check with canary clients.
"""
