#include <criterion/criterion.h>
Test(heuristic, placeholder) {}
