"""Planning in latent space and what it is measured on: CEM/MPPI (``planners``), the goal
protocols of ``swm eval`` (``goals``), the episodes played in the env (``episodes``) and their
pictures (``pictures``).
"""
