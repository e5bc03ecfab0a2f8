"""The job engine: the loop that claims jobs, the lease keeper that holds them, one
attempt at a job, and the reaper that resolves jobs whose worker died."""
