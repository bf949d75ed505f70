/* `podemu run`'s recording of HLO instructions with the client library (record.c). */
#ifndef PODEMU_CLI_RECORD_H
#define PODEMU_CLI_RECORD_H

#include <stdbool.h>

#include "hlo.h"
#include "podemu/podemu.h"
#include "status.h"

/* An instruction's value: one tensor, or the elements of a tuple. */
struct value {
	pe_tensor *t;
	int n;
	pe_tensor **elems;
	bool own_elems; /* elems made for this value (a while's, call's or conditional's result) */
	bool is_scalar_constant;
	double scalar;
};

struct runner {
	pe_client *c;
	const struct hlo_module *m;
	struct value *vals;
	struct status st;
};

/* Records instruction in of the computation whose values r->vals holds, into r->vals. */
int record(struct runner *r, const struct hlo_instruction *in);
/* The library's element type of an HLO one, or -1. */
int pe_type(enum hlo_type t);
/* Gives t the layout the module writes for in's value s (none written: nothing). */
int set_layout(struct runner *r, const struct hlo_instruction *in, pe_tensor *t,
               const struct hlo_shape *s);
/* UNIMPLEMENTED naming the instruction and why the pod cannot record it. */
int unimplemented(struct runner *r, const struct hlo_instruction *in, const char *why);

#endif
