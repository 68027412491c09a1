"""Files zbsolve writes for people and runtimes: the schedule document, torch's CSV, torchtitan and Megatron configs."""
