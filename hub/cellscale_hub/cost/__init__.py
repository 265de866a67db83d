"""What jobs cost: the ledger (metering every attempt, attribution of the fleet's cost), the
cloud pool's bill, and the estimate of a job's cost before it runs."""
