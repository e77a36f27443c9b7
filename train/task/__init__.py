"""Stage 4, task: what runs inside each task (this process for a plain run, one per device under `-m`) -- the
distributed environment, the checks on this node, our config -> llm-foundry's, and the callbacks that report and
track the run. main.run is where torch and llm-foundry are first imported.
"""
