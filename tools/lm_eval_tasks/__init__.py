"""lm-evaluation-harness task definitions shipped with z2all (run offline by tools.evaluate).

- z2all_demo_skills.yaml: the demo's skills by greedy generation, graded by its own grader;
- z2all_demo_choice.yaml: the same skills as multiple choice by log-likelihood;
- demo_task_data.py: their data loaders and grader; build_data.py writes their items.
"""
