#!/usr/bin/env python3
"""Generate the C-facing part of the Fortran module dsm from the C headers.

Reads include/dsm.h with the parts it includes (include/dsm/base.h, mesh.h,
config.h, engine.h, sp.h, data.h, in its order), the interop headers
include/dsm/*.h beside them (dsm/cuda.h) and the communicator
shim fortran/dsm_fshim.c (and, for the type(MPI_Comm) twins of its
integer-communicator specifics, fortran/dsm.f90), and writes three files that fortran/dsm.f90 includes:

  fortran/dsm_const.inc (specification part, first) the named constants of
                        every enum and integer #define, and the public
                        statement of the generated wrappers;
  fortran/dsm_iface.inc (specification part, after the derived types) the
                        bind(C) interface of every public C function (c_NAME)
                        and of every shim function (c_dsm_f_NAME);
  fortran/dsm_wrap.inc  (after contains) the wrappers that only call the C
                        function: handles in as mesh%ptr, strings in as
                        trim(s)//c_null_char, integer, logical and text
                        outputs converted, an optional trailing ierr; and
                        the type(MPI_Comm) twin of each integer-communicator
                        specific (F08_TWINS).

Usage: gen_fortran.py [--srcdir DIR] [--outdir DIR]

Every function the headers declare gets a generated wrapper unless
HAND_WRITTEN names it (its wrapper is in fortran/dsm.f90, where the Fortran
idiom differs: arrays, communicators, generics, callbacks); WRAP_OPTIONS
gives the details of some generated ones. A plain function renamed in dsm.h
needs only a new run; a table entry for a function the headers no longer
declare is an error naming it. Standard library only.
"""

import argparse
import glob
import os
import re
import sys

# ---------------------------------------------------------------- the tables

# Opaque handles: C type -> Fortran derived type (a bind(C) type wrapping a c_ptr).
HANDLES = {
    'dsm_mesh_t': 'dsm_mesh_t',
    'dsm_config_t': 'dsm_config_t',
    'dsm_engine_t': 'dsm_engine_t',
    'dsm_sp_t': 'dsm_sp_t',
    'dsm_sampler_t': 'dsm_sampler_t',
}

# C structures -> the bind(C) Fortran type with the same fields; None: passed
# as type(c_ptr), value (the Fortran side builds an array of them).
STRUCTS = {
    'dsm_sp_tensor_t': 'dsm_sp_tensor_t',
    'dsm_step_info_t': 'dsm_step_info_t',
    'dsm_engine_memory_t': 'dsm_engine_memory_t',
    'dsm_engine_options_t': 'dsm_engine_options_t',
    'dsm_sampler_options_t': 'c_sampler_options',
    'dsm_param_desc_t': None,
}

# Headers under include/dsm/ of libraries beside libdsm, not module dsm's.
SEPARATE_LIBRARIES = {'torch.h'}

# Pointer types of the interop headers: they cross as type(c_ptr).
FOREIGN_POINTERS = {'cudaStream_t'}

# Integer #defines whose Fortran kind is not default INTEGER.
CONSTANT_KINDS = {'DSM_IGNORE_INDEX': 'c_int64_t'}

# const char * parameters where '' (all blanks) means C NULL.
NULLABLE_STRINGS = {'group', 'tag'}

# (function, parameter) whose interface declaration is not the one the rules
# give: arrays and nullable outputs that cross as type(c_ptr), value.
INTERFACE_OVERRIDES = {
    ('dsm_step', 'info'): 'type(c_ptr), value',
    ('dsm_engine_load_checkpoint', 'client_state'): 'type(c_ptr), value',
    ('dsm_engine_load_checkpoint', 'size'): 'type(c_ptr), value',
    ('dsm_engine_resume', 'client_state'): 'type(c_ptr), value',
    ('dsm_engine_resume', 'size'): 'type(c_ptr), value',
    ('dsm_sampler_batch', 'indices'): 'type(c_ptr), value',
    ('dsm_sp_shard_batch', 'out_tokens'): 'type(c_ptr), value',
    ('dsm_sp_shard_batch', 'out_positions'): 'type(c_ptr), value',
    ('dsm_sp_shard_batch', 'out_labels'): 'type(c_ptr), value',
}

# Every function of the headers gets a generated wrapper of the same name,
# unless HAND_WRITTEN names it; a parameter the rules cannot express stops the
# script (then write the wrapper by hand). How some differ from the plain
# rules:
#   logical:  int outputs that are logical in Fortran (C: nonzero = true)
#   default:  size_t outputs that are default INTEGER (else integer(c_int64_t))
#   init:     the value an output starts from (else 0; stays when C fails)
#   on_error: the value an output gets when the call fails
#   optional: outputs that are optional arguments
#   sized:    array -> its length parameter: a contiguous assumed-shape
#             array whose size C gets as the length
#   specific: the wrapper is this private specific of a generic that
#             fortran/dsm.f90 declares (with the other, hand-written, forms)
WRAP_OPTIONS = {
    'dsm_library_feature': {'logical': ['enabled']},
    'dsm_dtype_size': {'default': ['size']},
    'dsm_mesh_dim_index': {'init': {'dim': '-1'}},
    'dsm_mesh_dim_rank': {'init': {'rank': '-1'}},
    'dsm_mesh_rank': {'init': {'rank': '-1'}},
    'dsm_config_batch': {'optional': ['train_batch_size', 'micro_batch_size',
                                          'gradient_accumulation_steps', 'data_parallel_size']},
    'dsm_engine_param_index': {'init': {'index': '-1'}, 'on_error': {'index': '-1'}},
    'dsm_engine_dtype': {'init': {'dtype': '-1'}},
    'dsm_engine_device': {'init': {'device': 'DSM_DEVICE_DEFAULT'}},
    'dsm_engine_batch': {'optional': ['train_batch_size', 'micro_batch_size',
                                          'gradient_accumulation_steps', 'data_parallel_size']},
    'dsm_engine_param_read_f32': {'sized': {'values': 'count'}, 'specific': 'param_read_f32_r1'},
    'dsm_engine_grad_add_f32': {'sized': {'grad': 'count'}, 'specific': 'grad_add_f32_r1'},
    'dsm_engine_stop_requested': {'logical': ['stop']},
    'dsm_engine_param_acquire': {'specific': 'param_acquire_ptr'},
    'dsm_engine_grad_acquire': {'specific': 'grad_acquire_ptr'},
    'dsm_sp_rank': {'init': {'rank': '-1'}},
    'dsm_sp_seq_to_head': {'specific': 'sp_seq_to_head_ptr'},
    'dsm_sp_head_to_seq': {'specific': 'sp_head_to_seq_ptr'},
}

# The functions whose wrappers fortran/dsm.f90 writes by hand.
HAND_WRITTEN = {
    'dsm_free', 'dsm_convert', 'dsm_report_error',
    'dsm_mesh_create', 'dsm_mesh_create_with_options', 'dsm_mesh_create_dp_sp', 'dsm_mesh_create_for_config',
    'dsm_mesh_shape', 'dsm_mesh_coords', 'dsm_mesh_comm', 'dsm_mesh_group_ranks',
    'dsm_mesh_slice', 'dsm_mesh_flatten', 'dsm_config_load',
    'dsm_engine_init', 'dsm_engine_init_comm', 'dsm_engine_init_with_options', 'dsm_engine_init_comm_with_options',
    'dsm_engine_init_with_config',
    'dsm_engine_param_shape',
    'dsm_step',
    'dsm_engine_save_checkpoint', 'dsm_engine_load_checkpoint', 'dsm_engine_resume',
    'dsm_sp_seq_to_head_n', 'dsm_sp_head_to_seq_n',
    'dsm_sp_shard_batch', 'dsm_sampler_create', 'dsm_sampler_create_for_engine', 'dsm_sampler_batch',
}

# The integer-communicator specifics of fortran/dsm.f90 (NAME_i) whose
# type(MPI_Comm) twins (NAME_f08) are generated.
F08_TWINS = ['mesh_create_i', 'mesh_create_with_options_i', 'mesh_create_dp_sp_i', 'mesh_create_for_config_i',
             'mesh_comm_i',
             'mesh_flatten_i', 'config_load_i', 'engine_init_comm_i', 'engine_init_comm_with_options_i']

# C integer types that cross as integer(c_int): unsigned (the flags) has the
# size of int and only ever holds small non-negative values.
INT_TYPES = {'int', 'unsigned', 'unsigned int'}
LINE_MAX = 110

# ---------------------------------------------------------------- parsing


def parse_enums(text, enum_types):
    """(typedef name, [(NAME, value)]) of every typedef enum."""
    out = []
    for m in re.finditer(r'typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;', text, re.S):
        body, tname = m.group(1), m.group(2)
        enum_types.add(tname)
        items = []
        for entry in body.split(','):
            entry = entry.strip()
            if not entry:
                continue
            em = re.fullmatch(r'(\w+)\s*=\s*(-?\w+)', entry)
            if not em:
                sys.exit('gen_fortran.py: enum %s: entry without an explicit value: %r' % (tname, entry))
            items.append((em.group(1), int(em.group(2), 0)))
        out.append((tname, items))
    return out


def parse_defines(text):
    """(NAME, value) of every #define DSM_* that is an integer literal."""
    out = []
    for m in re.finditer(r'^#define\s+(DSM_\w+)\s+\(?\s*(-?(?:0x[0-9A-Fa-f]+|\d+))[uUlL]*\s*\)?\s*$',
                         text, re.M):
        out.append((m.group(1), int(m.group(2), 0)))
    return out


def parse_param(decl, fname):
    decl = ' '.join(decl.split())
    m = re.fullmatch(r'(.*?)(\w+)\s*(\[\s*\])?', decl)
    if not m:
        sys.exit('gen_fortran.py: %s: cannot parse parameter %r' % (fname, decl))
    ctype, name, arr = m.group(1).strip(), m.group(2), bool(m.group(3))
    const = ctype.startswith('const ')
    base = ctype[6:] if const else ctype
    stars = base.count('*')
    base = base.replace('*', ' ').replace('const', ' ')
    base = ' '.join(base.split())
    return {'name': name, 'base': base, 'stars': stars, 'const': const, 'array': arr, 'decl': decl}


def parse_functions(text, prefix):
    """name -> (return type, [params]) of every prototype starting with prefix."""
    funcs = {}
    for m in re.finditer(prefix + r'\s*(.*?)\b(\w+)\s*\(([^)]*)\)\s*;', text, re.S):
        ret, name, args = ' '.join(m.group(1).split()), m.group(2), m.group(3).strip()
        params = [] if args in ('void', '') else [parse_param(a, name) for a in args.split(',')]
        for i, p in enumerate(params):
            p['pos'] = i
        funcs[name] = (ret, params)
    return funcs


# ---------------------------------------------------------------- interfaces


def classify(fname, p, enum_types):
    """The kind of a C parameter: how it crosses and how Fortran sees it."""
    base, stars, arr = p['base'], p['stars'], p['array']
    if base in ('MPI_Comm', 'MPI_Fint'):
        return 'fint_in' if p['const'] or stars == 0 else 'fint_out'
    if base in HANDLES:
        if stars == 0 and not arr:
            return 'handle'
        # dsm_X_free(dsm_X_t *h) reads the handle it nulls; a handle that a
        # call creates or returns comes after the inputs.
        return 'handle_free' if p['pos'] == 0 else 'handle_out'
    if base in STRUCTS:
        if STRUCTS[base] is None:
            return 'ptr'
        if arr:
            return 'struct_array'
        return 'struct_in' if p['const'] else 'struct_inout'
    if base in FOREIGN_POINTERS:
        return 'ptr' if stars == 0 else 'ptr_out'
    if base == 'void':
        if arr:
            return 'ptr_array'
        if stars == 2 and '_free' in fname:
            return 'ptr_free'  # dsm_X_free_memory(X, void **p) frees *p and nulls it
        return 'ptr' if stars == 1 else 'ptr_out'
    if base == 'char':
        if arr:
            return 'str_array'
        if stars == 1:
            return 'str_null' if p['name'] in NULLABLE_STRINGS else 'str'
        return 'text_out' if not p['const'] else 'cstr_out'
    num = {'int64_t': 'i64', 'size_t': 'size', 'double': 'dbl', 'float': 'flt'}.get(base)
    if num is None and (base in INT_TYPES or base in enum_types):
        num = 'int'
    if num is None:
        sys.exit('gen_fortran.py: %s: no rule for parameter %r' % (fname, p['decl']))
    if arr or (stars == 1 and num == 'flt') or (stars == 1 and p['const']):
        return num + '_array_in' if p['const'] else num + '_array_out'
    return num if stars == 0 else num + '_out'


CKIND = {'int': 'integer(c_int)', 'i64': 'integer(c_int64_t)', 'size': 'integer(c_size_t)',
         'dbl': 'real(c_double)', 'flt': 'real(c_float)'}


def iface_decl(fname, p, kind):
    over = INTERFACE_OVERRIDES.get((fname, p['name']))
    if over:
        return over
    if kind in CKIND:
        return CKIND[kind] + ', value'
    if kind.endswith('_array_in') or kind.endswith('_array_out'):
        num = kind.split('_')[0]
        if num == 'i64' and kind.endswith('_in'):
            return 'type(c_ptr), value'    # may be NULL (positions, labels)
        return CKIND[num] + ', dimension(*), intent(%s)' % ('in' if kind.endswith('_in') else 'out')
    if kind.endswith('_out') and kind[:-4] in CKIND:
        return CKIND[kind[:-4]] + ', intent(out)'
    return {
        'fint_in': 'integer(c_fint), intent(in)',
        'fint_out': 'integer(c_fint), intent(out)',
        'handle': 'type(c_ptr), value',
        'handle_free': 'type(c_ptr), intent(inout)',
        'handle_out': 'type(c_ptr), intent(out)',
        'struct_in': 'type(%s), intent(in)' % STRUCTS.get(p['base']),
        'struct_inout': 'type(%s), intent(inout)' % STRUCTS.get(p['base']),
        'struct_array': 'type(%s), dimension(*), intent(in)' % STRUCTS.get(p['base']),
        'ptr': 'type(c_ptr), value',
        'ptr_out': 'type(c_ptr), intent(out)',
        'ptr_free': 'type(c_ptr), intent(inout)',
        'ptr_array': 'type(c_ptr), dimension(*), intent(in)',
        'str': 'character(kind=c_char), dimension(*), intent(in)',
        'str_null': 'type(c_ptr), value',
        'str_array': 'type(c_ptr), dimension(*), intent(in)',
        'text_out': 'type(c_ptr), intent(out)',
        'cstr_out': 'type(c_ptr), intent(out)',
    }[kind]


def imports_of(decls):
    names = set()
    for d in decls:
        for n in re.findall(r'\b(c_\w+|dsm_\w+_t)\b', d):
            if n not in ('c_null_char',):
                names.add(n)
    return sorted(names)


def wrap_line(head, items, indent, sep=', ', cont='&'):
    """head + items joined by sep, continued with & where it gets long."""
    lines, cur = [], head
    for i, it in enumerate(items):
        piece = it + (sep if i < len(items) - 1 else '')
        if len(cur) + len(piece.rstrip()) + 2 > LINE_MAX and cur.strip() != head.strip():
            lines.append(cur.rstrip() + ' ' + cont)
            cur = ' ' * (indent + 5) + piece
        else:
            cur += piece
    lines.append(cur)
    return lines


def interface(fname, ret, params, enum_types):
    cname = 'c_' + fname
    args = [p['name'] for p in params]
    decls = [(p['name'], iface_decl(fname, p, classify(fname, p, enum_types))) for p in params]
    if ret == 'dsm_status_t':
        rdecl, kind = 'integer(c_int)', 'function'
    elif ret == 'const char *':
        rdecl, kind = 'type(c_ptr)', 'function'
    elif ret == 'void':
        rdecl, kind = None, 'subroutine'
    else:
        sys.exit('gen_fortran.py: %s: no rule for the return type %r' % (fname, ret))
    tail = " bind(C, name='%s')" % fname + (' result(st)' if rdecl else '')
    out = wrap_line('     %s %s(' % (kind, cname), args, 5, ', ')
    out[-1] += ')'
    if len(out[-1]) + len(tail) > LINE_MAX:
        out[-1] += ' &'
        out.append('         ' + tail.strip())
    else:
        out[-1] += tail
    out.append('       import :: ' + ', '.join(imports_of([d for _, d in decls] + ([rdecl] if rdecl else []))))
    for name, d in decls:
        out.append('       %s :: %s' % (d, name))
    if rdecl:
        out.append('       %s :: st' % rdecl)
    out.append('     end %s %s' % (kind, cname))
    return out


# ---------------------------------------------------------------- wrappers


FKIND = {'int': 'integer', 'i64': 'integer(c_int64_t)', 'size': 'integer(c_int64_t)',
         'dbl': 'real(c_double)', 'flt': 'real(c_float)'}


def wrapper(fname, ret, params, opts, enum_types):
    if ret == 'const char *':
        return string_function(fname, params, enum_types)
    sized = opts.get('sized', {})
    lengths = {v: k for k, v in sized.items()}
    logical = set(opts.get('logical', []))
    default = set(opts.get('default', []))
    init = opts.get('init', {})
    on_error = opts.get('on_error', {})
    optional = set(opts.get('optional', []))
    for key in ('logical', 'default', 'optional', 'sized'):
        for n in list(opts.get(key, [])) + list(sized.values() if key == 'sized' else []):
            if n not in [p['name'] for p in params]:
                sys.exit('gen_fortran.py: WRAP_OPTIONS[%s] names %s, not a parameter' % (fname, n))
    dummies, locals_, before, call, after = [], [], [], [], []
    for p in params:
        n, kind = p['name'], classify(fname, p, enum_types)
        opt = ', optional' if n in optional else ''
        if n in lengths:
            call.append('int(size(%s), %s)' % (lengths[n], {'i64': 'c_int64_t', 'size': 'c_size_t',
                                                             'int': 'c_int'}[kind]))
        elif n in sized:
            ftype = CKIND[kind.split('_')[0]]
            intent = 'in' if kind.endswith('_in') else 'out'
            dummies.append(('%s, dimension(:), contiguous, intent(%s)' % (ftype, intent), n))
            call.append(n)
        elif kind == 'handle':
            dummies.append(('type(%s), intent(in)' % HANDLES[p['base']], n))
            call.append(n + '%ptr')
        elif kind in ('handle_free', 'handle_out'):
            intent = 'inout' if kind == 'handle_free' else 'out'
            dummies.append(('type(%s), intent(%s)' % (HANDLES[p['base']], intent), n))
            call.append(n + '%ptr')
        elif kind == 'int':
            dummies.append(('integer, intent(in)', n))
            call.append('int(%s, c_int)' % n)
        elif kind in ('i64', 'dbl', 'flt'):
            dummies.append((FKIND[kind] + ', intent(in)', n))
            call.append(n)
        elif kind == 'size':
            dummies.append(('integer(c_int64_t), intent(in)', n))
            call.append('int(%s, c_size_t)' % n)
        elif kind in ('int_out', 'size_out') or (kind in ('i64_out', 'dbl_out') and n in optional):
            ckind = {'int_out': 'integer(c_int)', 'size_out': 'integer(c_size_t)',
                     'i64_out': 'integer(c_int64_t)', 'dbl_out': 'real(c_double)'}[kind]
            if n in logical:
                ftype = 'logical'
            elif kind == 'int_out' or n in default:
                ftype = 'integer'
            else:
                ftype = FKIND[kind[:-4]]
            dummies.append((ftype + ', intent(out)' + opt, n))
            t = 'tmp_' + n
            locals_.append((ckind, t))
            before.append('%s = %s' % (t, init.get(n, '0')))
            call.append(t)
            if n in logical:
                val = '%s /= 0' % t
            elif ftype == 'integer':
                val = 'int(%s)' % t
            elif ftype == ckind:
                val = t
            else:
                val = 'int(%s, c_int64_t)' % t
            if n in on_error:
                after.append('if (st /= DSM_SUCCESS) %s = %s' % (t, on_error[n]))
            after.append(('if (present(%s)) ' % n if opt else '') + '%s = %s' % (n, val))
        elif kind in ('i64_out', 'dbl_out'):
            dummies.append((FKIND[kind[:-4]] + ', intent(out)', n))
            before.append('%s = %s' % (n, init.get(n, '0')))
            call.append(n)
        elif kind == 'str':
            dummies.append(('character(len=*), intent(in)', n))
            call.append('trim(%s) // c_null_char' % n)
        elif kind == 'str_null':
            dummies.append(('character(len=*), intent(in)', n))
            locals_.append(('character(kind=c_char), dimension(:), allocatable, target', 'buf_' + n))
            locals_.append(('type(c_ptr)', 'p_' + n))
            before.append('call c_string_or_null(%s, buf_%s, p_%s)' % (n, n, n))
            call.append('p_' + n)
        elif kind in ('text_out', 'cstr_out'):
            dummies.append(('character(len=:), allocatable, intent(out)', n))
            locals_.append(('type(c_ptr)', 'p_' + n))
            before.append('p_%s = c_null_ptr' % n)
            call.append('p_' + n)
            after.append('%s = c_to_f_string(p_%s)' % (n, n))
            if kind == 'text_out':
                after.append('call c_dsm_free(p_%s)' % n)
        elif kind == 'ptr':
            dummies.append(('type(c_ptr), intent(in)', n))
            call.append(n)
        elif kind == 'ptr_out':
            dummies.append(('type(c_ptr), intent(out)', n))
            before.append('%s = c_null_ptr' % n)
            call.append(n)
        elif kind == 'ptr_free':
            dummies.append(('type(c_ptr), intent(inout)', n))
            call.append(n)
        elif kind == 'struct_in':
            dummies.append(('type(%s), intent(in)' % STRUCTS[p['base']], n))
            call.append(n)
        elif kind == 'struct_inout':
            dummies.append(('type(%s), intent(inout)' % STRUCTS[p['base']], n))
            call.append(n)
        else:
            sys.exit('gen_fortran.py: %s: parameter %s (%s) has no generated form: write its '
                     'wrapper in fortran/dsm.f90 and add it to HAND_WRITTEN' % (fname, n, kind))
    names = [n for _, n in dummies] + ['ierr']
    sname = opts.get('specific', fname)
    out = wrap_line('  subroutine %s(' % sname, names, 2)
    out[-1] += ')'
    # one declaration line per dummy, merged when the declarations agree
    decls = dummies + [('integer, intent(out), optional', 'ierr')]
    merged = []
    for d, n in decls:
        if merged and merged[-1][0] == d and len(merged[-1][1]) < 3:
            merged[-1][1].append(n)
        else:
            merged.append((d, [n]))
    for d, ns in merged:
        out.append('    %s :: %s' % (d, ', '.join(ns)))
    for d, n in locals_:
        out.append('    %s :: %s' % (d, n))
    out.append('    integer(c_int) :: st')
    out.append('')
    for b in before:
        out.append('    ' + b)
    c = wrap_line('    st = c_%s(' % fname, call, 4)
    c[-1] += ')'
    out += c
    for a in after:
        out.append('    ' + a)
    out.append("    call finish(st, '%s', ierr)" % fname)
    out.append('  end subroutine %s' % sname)
    return out


def string_function(fname, params, enum_types):
    """A C function returning a constant string: a Fortran function
    returning character(len=:), allocatable, its integer arguments converted."""
    dummies, call = [], []
    for p in params:
        if classify(fname, p, enum_types) != 'int':
            sys.exit('gen_fortran.py: %s: parameter %s has no generated form: write its wrapper in '
                     'fortran/dsm.f90 and add it to HAND_WRITTEN' % (fname, p['name']))
        dummies.append(p['name'])
        call.append('int(%s, c_int)' % p['name'])
    out = ['  function %s(%s) result(s)' % (fname, ', '.join(dummies))]
    out += ['    integer, intent(in) :: %s' % d for d in dummies]
    out += ['    character(len=:), allocatable :: s', '',
            '    s = c_to_f_string(c_%s(%s))' % (fname, ', '.join(call)),
            '  end function %s' % fname]
    return out


def f08_twin(name, module_text):
    """The type(MPI_Comm) specific of the hand-written integer specific name
    (NAME_i -> NAME_f08): the same dummies, comm a type(MPI_Comm) (required:
    the integer form alone may make it optional, or the generic would be
    ambiguous), passing comm%MPI_VAL."""
    m = re.search(r'^  subroutine %s\(([^)]*)\)\n(.*?)\n\n' % name,
                  re.sub(r'&\n\s*', '', module_text), re.M | re.S)
    if not m:
        sys.exit('gen_fortran.py: F08_TWINS: no subroutine %s in fortran/dsm.f90' % name)
    args = [a.strip() for a in m.group(1).split(',')]
    if 'comm' not in args:
        sys.exit('gen_fortran.py: F08_TWINS: %s has no dummy comm' % name)
    decls = []
    for line in m.group(2).split('\n'):
        d, _, ents = line.strip().partition(' :: ')
        ents = [e.strip() for e in ents.split(',')]
        if not all(e in args for e in ents):
            continue
        if ents == ['comm']:
            intent = re.search(r'intent\(\w+\)', d)
            d = 'type(MPI_Comm), ' + (intent.group(0) if intent else 'intent(in)')
        decls.append('    %s :: %s' % (d, ', '.join(ents)))
    twin = name[:-2] + '_f08'
    out = wrap_line('  subroutine %s(' % twin, args, 2)
    out[-1] += ')'
    out += decls + ['']
    c = wrap_line('    call %s(' % name, ['comm%MPI_VAL' if a == 'comm' else a for a in args], 4)
    c[-1] += ')'
    out += c
    out.append('  end subroutine %s' % twin)
    return out


# ---------------------------------------------------------------- main


HEADER = """\
! Generated by fortran/gen_fortran.py from {sources}: do not edit.
! Change the C headers (or the tables of the script) and run `make` (or
! python3 fortran/gen_fortran.py --srcdir .) to regenerate it.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--srcdir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    ap.add_argument('--outdir', help='where to write the three files (default SRCDIR/fortran)')
    a = ap.parse_args()
    src = a.srcdir
    outdir = a.outdir or os.path.join(src, 'fortran')
    os.makedirs(outdir, exist_ok=True)

    # dsm.h, the parts it includes in its order, then the interop headers.
    umbrella = os.path.join(src, 'include', 'dsm.h')
    with open(umbrella, encoding='utf-8') as f:
        parts = [os.path.normpath(os.path.join(src, 'include', p))
                 for p in re.findall(r'(?m)^#include "(dsm/\w+\.h)"', f.read())]
    # The headers of the libraries beside libdsm (dsm/torch.h: libdsm_torch)
    # are not module dsm's.
    interop = sorted(h for h in (os.path.normpath(g) for g in glob.glob(os.path.join(src, 'include', 'dsm', '*.h')))
                     if h not in parts and os.path.basename(h) not in SEPARATE_LIBRARIES)
    headers = [umbrella] + parts + interop
    shim = os.path.join(src, 'fortran', 'dsm_fshim.c')
    enum_types = set()
    enums, defines, funcs = [], [], {}
    for h in headers:
        with open(h, encoding='utf-8') as f:
            text = re.sub(r'/\*.*?\*/', ' ', f.read(), flags=re.S)
        enums += parse_enums(text, enum_types)
        defines += [d for d in parse_defines(text) if not d[0].endswith('_H')]
        funcs.update(parse_functions(text, r'(?m)^DSM_API'))
    with open(shim, encoding='utf-8') as f:
        shim_text = re.sub(r'/\*.*?\*/', ' ', f.read(), flags=re.S)
    shim_funcs = parse_functions(shim_text, r'(?m)^dsm_status_t(?=\s+dsm_f_\w+\s*\([^)]*\)\s*;)')
    shim_funcs = {n: (('dsm_status_t',) + v[1:]) for n, v in shim_funcs.items()}

    if not funcs:
        sys.exit('gen_fortran.py: no DSM_API function found in %s' % ', '.join(headers))
    stale = sorted((set(WRAP_OPTIONS) | HAND_WRITTEN) - set(funcs))
    if stale:
        sys.exit('gen_fortran.py: the tables name functions the headers do not declare '
                 '(renamed or removed?): %s' % ' '.join(stale))
    both = sorted(set(WRAP_OPTIONS) & HAND_WRITTEN)
    if both:
        sys.exit('gen_fortran.py: both WRAP_OPTIONS and HAND_WRITTEN: %s' % ' '.join(both))
    wrapped = {n: WRAP_OPTIONS.get(n, {}) for n in funcs if n not in HAND_WRITTEN}
    for (fn, pn) in INTERFACE_OVERRIDES:
        if fn not in funcs or pn not in [p['name'] for p in funcs[fn][1]]:
            sys.exit('gen_fortran.py: INTERFACE_OVERRIDES names %s(%s), which the headers do not declare'
                     % (fn, pn))

    rel = ', '.join(['include/dsm.h (with its parts)'] +
                    [os.path.relpath(p, src) for p in interop + [shim]]) + ' and fortran/dsm.f90'
    c = HEADER.format(sources=rel).splitlines()
    c.append('')
    c.append('  ! ------------------------------------------------------------ constants')
    seen = set()
    for tname, items in enums:
        c.append('  ! %s' % tname)
        for n, v in items:
            seen.add(n)
            c.append('  integer, parameter, public :: %s = %d' % (n, v))
    c.append('  ! #define')
    for n, v in defines:
        if n in seen:
            continue
        k = CONSTANT_KINDS.get(n)
        if k:
            c.append('  integer(%s), parameter, public :: %s = %d_%s' % (k, n, v, k))
        else:
            c.append('  integer, parameter, public :: %s = %d' % (n, v))
    c.append('')
    c.append('  ! ------------------------------------------------------------ generated wrappers')
    c += wrap_line('  public :: ', sorted(n for n in wrapped if 'specific' not in wrapped[n]), 2)

    i = HEADER.format(sources=rel).splitlines()
    i.append('')
    i.append('  ! ------------------------------------------------------------ the C functions')
    i.append('  interface')
    for name in funcs:
        ret, params = funcs[name]
        if any(p['base'] == 'MPI_Comm' for p in params):
            continue    # bound through the shim
        i += interface(name, ret, params, enum_types)
        i.append('')
    i.append('     ! Shim (fortran/dsm_fshim.c): communicators cross as MPI_Fint.')
    for name in shim_funcs:
        ret, params = shim_funcs[name]
        i += interface(name, ret, params, enum_types)
        i.append('')
    i[-1] = '  end interface'

    w = HEADER.format(sources=rel).splitlines()
    w.append('! See doc/fortran.md for each routine; ierr and the conversions are those')
    w.append('! of the conventions in fortran/dsm.f90.')
    for name in funcs:
        if name in wrapped:
            w.append('')
            w += wrapper(name, funcs[name][0], funcs[name][1], wrapped[name], enum_types)
    with open(os.path.join(src, 'fortran', 'dsm.f90'), encoding='utf-8') as f:
        module_text = f.read()
    w.append('')
    w.append('! The type(MPI_Comm) specifics: the integer ones of fortran/dsm.f90 with comm%MPI_VAL.')
    for name in F08_TWINS:
        w.append('')
        w += f08_twin(name, module_text)

    for base, lines in (('dsm_const.inc', c), ('dsm_iface.inc', i), ('dsm_wrap.inc', w)):
        path = os.path.join(outdir, base)
        text = '\n'.join(lines) + '\n'
        tmp = path + '.tmp'
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(tmp, path)


if __name__ == '__main__':
    main()
