#include <criterion/criterion.h>
Test(problem, placeholder) {}
