"""The kernel AST's public face, as DESIGN.md's table names it: the op enums, `LazyOp` and its records (kernopt.lazyop),
the op-semantics table (kernopt.alu), verification and cost (kernopt.verify), the canonical serialization and
digest (kernopt.serialize). Imports lazyop, alu, verify and serialize; it defines nothing of its own."""
from kernopt.alu import (DOMAINS, KINDS, OP_SEMANTICS, PYTHON_ALU, alu_result_dtype, defined_on, exec_alu,
                         operand_kind, truncate_float)
from kernopt.lazyop import (ALUOp, BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, Op,
                            ReduceOps, TernaryOps, UNSAFE_PAD_OPS, UnaryOps, WMMAArg, format_tree, pad_unsafe,
                            print_tree, shape_str, walk_ops)
from kernopt.serialize import (AST_FORMAT_VERSION, ast_digest, ast_dumps, ast_from_json, ast_to_json, load_ast,
                               save_ast, save_if_asked, value_from_json, value_to_json)
from kernopt.verify import FlopCounter, LazyOpInfo, get_lazyop_info, verify_lazyop

__all__ = ["UnaryOps", "BinaryOps", "TernaryOps", "ReduceOps", "BufferOps", "MetaOps", "Op", "ALUOp", "UNSAFE_PAD_OPS",
           "pad_unsafe", "MemBuffer", "ConstBuffer", "KernelInfo", "WMMAArg", "LazyOp", "walk_ops", "format_tree",
           "print_tree",
           "shape_str", "OP_SEMANTICS", "PYTHON_ALU", "DOMAINS", "KINDS", "operand_kind", "defined_on", "exec_alu",
           "truncate_float", "alu_result_dtype", "verify_lazyop", "get_lazyop_info", "LazyOpInfo", "FlopCounter",
           "AST_FORMAT_VERSION", "ast_to_json", "ast_from_json", "ast_dumps", "ast_digest", "value_to_json",
           "value_from_json", "save_ast", "load_ast", "save_if_asked"]
