"""Device profiles and what an op or a copy costs on one."""
