"""The job runtime every job uses: where work runs (placement), tasks inline or on Ray with one retry policy
(tasks), a job's units through its stages (units), the plan -> units -> commit -> manifest flow (job, output),
and the Ray cluster and its pools (cluster, pools)."""
