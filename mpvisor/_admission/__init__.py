"""How does submitted work reach the registry, one owner per slot?

Owns the controller: `config` (`ControllerConfig`), `slots` (the pure `SlotTable`),
`submission` (`ControllerSpec`, `PreparedSubmission`, the snapshot), `controller` (the loop that
applies the table's effects) and `leases/` (slots shared beyond this process, behind the
`LeaseStore` seam).

May import: `_model`, `_attempt`, `_tasks`, `_platform`.
"""
