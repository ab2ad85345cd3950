#include <criterion/criterion.h>
Test(exact, placeholder) {}
