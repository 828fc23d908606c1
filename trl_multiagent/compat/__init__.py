"""Other libraries' names, translated into this package's: CoMLRL 1.4.3 (`comlrl`). The core reaches it through two
seams only: `MAGRPOConfig`'s constructor (`comlrl.config_keywords`) and `arguments.prepare`'s call of
`comlrl.trainer_arguments`."""
