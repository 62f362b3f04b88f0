"""Which link: the known fabric (topology), class paths learned from traces (links),
tomography over the probed ECMP classes (localize) and the plan that covers every link
(plan)."""
