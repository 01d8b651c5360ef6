"""AutoMem (seed 003, DESIGN §8): memory-architecture search over Encode / Store / Retrieve / Manage.

    from routers.automem import Arch, valid, MemorySystem, load_system, run_automem, run_random
    arch = Arch(("trajectory", "insight"), "hybrid", "cbr_rerank", "json_full")
    valid(arch)                                         # cross-module constraints (routers.automem.space)
    mem = MemorySystem(arch)                            # a MemoryProvider the MemAgent rollout injects
    trace = run_automem(evaluate, search_tasks, val_tasks, budget=15, seed=0, trace_path="trace.json")
    mem = load_system("outputs/automem/memory_system.json")   # the exported best architecture

Modules: ``space`` (menu, ``valid``), ``encoders`` / ``manage`` / ``retrieval`` / ``system`` (the composable
memory system), ``evaluate`` (the evaluation function; real rollouts by default), ``diagnosis`` (scope gate,
failure modes -> module, textual gradient), ``ledger`` (experience ledger, observation graph, Pareto front),
``proposer`` (rule / LLM), ``trace`` (resumable trace) and ``search`` (AutoMem loop, random search).
"""

from routers.automem.diagnosis import FAILURE_MODULE, classify, diagnose, scope
from routers.automem.evaluate import Evaluation, RolloutEvaluator, TaskResult, run_evaluation
from routers.automem.ledger import Ledger, ObservationGraph, pareto_front
from routers.automem.proposer import LLMProposer, Proposal, RuleProposer
from routers.automem.search import run_automem, run_random
from routers.automem.space import (ENCODE, KNOWN_SYSTEMS, MANAGE, MENU, RETRIEVE, STORE, Arch, all_archs,
                                   feasible_space, valid, violations)
from routers.automem.system import (MemorySystem, build_system, load_system, read_system_config, save_system_config,
                                    system_config)
from routers.automem.trace import best_so_far, first_reach

__all__ = ["Arch", "valid", "violations", "all_archs", "feasible_space", "ENCODE", "STORE", "RETRIEVE", "MANAGE",
           "MENU", "KNOWN_SYSTEMS", "MemorySystem", "build_system", "load_system", "read_system_config",
           "save_system_config", "system_config", "TaskResult", "Evaluation", "RolloutEvaluator", "run_evaluation",
           "diagnose", "classify", "scope", "FAILURE_MODULE", "Ledger", "ObservationGraph", "pareto_front",
           "RuleProposer", "LLMProposer", "Proposal", "run_automem", "run_random", "best_so_far", "first_reach"]
