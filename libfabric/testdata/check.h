// check.h: the test programs' one assertion. CHECK(cond, fmt, ...) prints
// "FAIL file:line: " and the message, and exits 1, when cond is false.
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                                                       \
	do {                                                                                                                   \
		if (!(cond)) {                                                                                                 \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                            \
			printf(__VA_ARGS__);                                                                                   \
			printf("\n");                                                                                          \
			exit(1);                                                                                               \
		}                                                                                                              \
	} while (0)
#endif
