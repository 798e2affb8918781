"""reasoning-gym's published eval config, as the rg benchmark and the rg parity check draw it
(the family's own data layer: `conveyor.app.benchmarks` and `conveyor.tasks.parity` read it)."""

from __future__ import annotations

# reasoning-gym's published eval config `eval/yaml/deepseek-r1.yaml` (open-thought/reasoning-gym,
# commit 905b88f): every dataset of its categories, `default_size: 50`, `default_seed: 45`, no
# dataset params (so each dataset's default config). Its system prompt is reasoning-gym's
# `SYSTEM_PROMPTS["default"]` (the eval script's default `system_prompt_id`).
RG_CONFIG_NAME = "reasoning-gym eval/yaml/deepseek-r1.yaml (commit 905b88f)"
RG_SEED = 45
RG_SIZE = 50
RG_PUBLISHED: tuple[str, ...] = (
    # algebra
    "complex_arithmetic", "intermediate_integration", "polynomial_equations",
    "polynomial_multiplication", "simple_equations", "simple_integration",
    # algorithmic
    "ab", "base_conversion", "binary_alternation", "binary_matrix", "caesar_cipher",
    "count_primes", "cryptarithm", "game_of_life", "graph_color", "group_anagrams",
    "isomorphic_strings", "jugs", "letter_counting", "letter_jumble", "manipulate_matrix",
    "number_filtering", "number_sorting", "palindrome", "palindrome_partitioning", "pool_matrix",
    "ransom_note", "rotate_matrix", "rotten_oranges", "sentence_reordering", "spell_backward",
    "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting",
    "string_synthesis", "word_ladder", "word_sequence_reversal", "word_sorting",
    # arc
    "arc_1d", "arc_agi", "rearc",
    # arithmetic
    "basic_arithmetic", "bitwise_arithmetic", "calendar_arithmetic", "chain_sum", "count_bits",
    "decimal_arithmetic", "decimal_chain_sum", "dice", "fraction_simplification", "gcd",
    "gsm_symbolic", "lcm", "leg_counting", "number_format", "power_function",
    "prime_factorization", "products", "time_intervals",
    # code
    "bf", "codeio",
    # cognition
    "color_cube_rotation", "figlet_font", "needle_haystack", "number_sequence",
    "rectangle_count", "rubiks_cube",
    # games
    "countdown", "emoji_mystery", "futoshiki", "knight_swap", "maze", "mini_sudoku", "n_queens",
    "rush_hour", "sokoban", "sudoku", "tower_of_hanoi", "tsumego",
    # geometry
    "advanced_geometry", "simple_geometry",
    # graphs
    "course_schedule", "family_relationships", "largest_island", "quantum_lock",
    "shortest_path",
    # induction
    "list_functions",
    # logic
    "aiw", "circuit_logic", "knights_knaves", "propositional_logic", "self_reference",
    "syllogism", "zebra_puzzles",
)  # fmt: skip


def rg_split() -> tuple[list[str], dict[str, str]]:
    """The published config's datasets this reasoning-gym can run here, and every dropped one
    with the reason (not in the installed version; refused by `scoring.REFUSED`)."""
    from conveyor.tasks.rg import scoring

    known = set(scoring.dataset_names())
    kept: list[str] = []
    dropped: dict[str, str] = {}
    for name in RG_PUBLISHED:
        if name not in known:
            dropped[name] = "not a dataset of the installed reasoning-gym"
        elif name in scoring.REFUSED:
            dropped[name] = scoring.REFUSED[name]
        else:
            kept.append(name)
    return kept, dropped
