"""Where do attempts run?

The launcher seam (`seam`: `Launcher` for requests, `AttemptSink` for reports,
`LauncherFactory` and the `LaunchSettings` it is given, `ExitStatus`) and one folder or file per
implementation beside it: `local/` (a fork server on this machine, the default) and `ray`
(attempts under agents on a Ray cluster). An implementation imports the seam, never the other
way round.

May import: `_model`, `_attempt`, `_platform`.
"""
