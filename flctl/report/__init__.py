"""Reports: the paper's tables and figures from the run database and the Parquet records (never torch)."""
